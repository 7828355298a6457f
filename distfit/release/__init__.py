"""distfit.release"""

"""distfit.data"""

"""distfit.spec"""

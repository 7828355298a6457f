"""distfit.stores"""

"""distfit.cli"""

"""distfit.solver"""

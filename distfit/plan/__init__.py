"""distfit.plan"""

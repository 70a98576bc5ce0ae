"""zbk.cli"""

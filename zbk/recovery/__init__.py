"""zbk.recovery"""

"""zbk.storage"""

"""zbk.actors"""

"""zbk.client"""

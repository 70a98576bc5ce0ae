"""zbk.spark"""

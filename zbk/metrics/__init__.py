"""zbk.metrics"""

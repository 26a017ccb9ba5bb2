"""router_client"""

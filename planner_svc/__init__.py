"""planner_svc"""

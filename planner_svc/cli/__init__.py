"""planner_svc/cli"""

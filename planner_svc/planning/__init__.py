"""planner_svc/planning"""

"""planner_svc/control"""

"""planner_svc/replay"""

"""planner_svc.api"""

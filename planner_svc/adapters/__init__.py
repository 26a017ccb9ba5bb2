"""planner_svc.adapters"""

"""planner_svc.devstack"""

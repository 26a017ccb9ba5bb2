"""planner_svc.orchestration"""

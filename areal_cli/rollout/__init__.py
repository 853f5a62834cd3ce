"""areal_cli.rollout"""

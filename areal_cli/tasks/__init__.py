"""areal_cli.tasks"""

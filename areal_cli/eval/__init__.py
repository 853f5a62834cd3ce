"""areal_cli.eval"""

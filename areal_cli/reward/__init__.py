"""areal_cli.reward"""

"""areal_cli.trainer"""

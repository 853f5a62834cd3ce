"""areal_cli.models"""

"""rebase"""

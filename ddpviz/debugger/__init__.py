"""The debugger across ranks (issue #39): pause every rank at one safe point, inspect, resume.

protocol.py is the wire protocol (torch-free; the notebook side imports it); the rank side's
modules run inside a rank and never import UI code.
"""

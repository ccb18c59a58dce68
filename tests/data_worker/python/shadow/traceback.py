"""A traceback.py in a team folder (python_op_test): it must not replace the standard library's
module the runner imports."""
raise ImportError("the team's traceback.py was imported in place of the standard library's")

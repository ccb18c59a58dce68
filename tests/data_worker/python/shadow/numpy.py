"""A team folder holding a numpy.py of its own (python_op_test): it must not replace the numpy
the Python process's runner imports."""
raise ImportError("the team's numpy.py was imported in place of numpy")

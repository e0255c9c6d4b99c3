"""One folder per decode-step op, each with the same anatomy:

``__init__.py`` (re-exports), ``api.py`` (validate -> allocate -> pick config -> launch),
``ref.py`` (the PyTorch twin), ``_triton.py`` (kernels and launchers, private),
``config.py`` (frozen launch config + the rule that picks it, where needed).
"""

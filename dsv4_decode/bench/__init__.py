"""Benchmarks: ``dsv4-decode bench <op>`` runs ``dsv4_decode.bench.<op>.main(argv)``.

Shared pieces: ``timing`` (CUDA-graph replay timing), ``results`` (the CSV rows and tables),
``roofline`` (HBM byte floors).
"""

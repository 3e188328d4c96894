"""`imgops bench`: kernel timings (kernels.py), batch timings (pipeline.py), tables (report.py).

Nothing here is imported by `imgops --help`; each module imports torch or cv2 only when it runs.
"""

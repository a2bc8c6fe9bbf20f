"""The commands: one module per top-level script (create_webdataset.py -> create_webdataset.main).

`pip install .` installs each as a console command (pyproject.toml, [project.scripts]), so an installed
package works without this checkout; the top-level .py files are thin wrappers around these mains.
"""

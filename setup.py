"""Package layout that pyproject.toml cannot express: the repository keeps `runtime/`, `hwprofiles/`
and `scenarios/` at its top level, and the wheel installs them inside the zsim package, as
`zsim.runtime` (a generic top-level name like `runtime` would collide with other projects) and as the
package data `zsim.hwprofiles` and `zsim.scenarios` (found with importlib.resources, see
zsim/config/profiles.py). Packages are discovered, so a new subpackage (zsim/compute/, runtime/x/)
is shipped without editing this file; tests/test_packaging.py checks the built wheel."""

from setuptools import find_namespace_packages, find_packages, setup

CODE = {"zsim.runtime": "runtime"}
DATA = {"zsim.hwprofiles": "hwprofiles", "zsim.scenarios": "scenarios"}

# namespace packages too: zsim/validate/suites/ holds the validation suites' YAML (zsim validate replay),
# data without an __init__.py that setuptools would otherwise warn about and ship only by accident
packages = find_namespace_packages(include=["zsim", "zsim.*"], exclude=["*__pycache__*"])
for name, folder in CODE.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
for name, folder in DATA.items():  # data subfolders (gpus/, paper/) have no __init__.py
    packages += [name] + [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["__pycache__*"])]

setup(packages=packages, package_dir={**CODE, **DATA}, package_data={"": ["*.yaml", "*.json"]})

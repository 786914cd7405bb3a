"""The tool and verifier sources copied into generated bundles (``tools.py`` / ``verify.py``).

They run only inside the sandbox, as files of a bundle: standard library only, no imports of
``dsv32``. The host never imports them.
"""

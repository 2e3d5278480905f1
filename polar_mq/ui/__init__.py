"""The dashboard at `/ui`: server-rendered pages over the API's read services, live through SSE.

`install_ui(app, settings)` mounts it on the API app (see `polar_mq.ui.routes`). No JavaScript
toolchain and no CDN: Jinja2 templates, one small hand-written script and one stylesheet.
"""

from polar_mq.ui.routes import install_ui

__all__ = ["install_ui"]

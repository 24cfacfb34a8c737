"""JavaScript rendering with scrapy-playwright and Debian's Chromium.

Chromium renders a request only when its ``meta["playwright"]`` is true, when
a URL rule matches it (:mod:`~project.rendering.middleware`), or when a spider
asks for a second, rendered fetch (``FALLBACK_META_KEY``). Everything else goes
through Scrapy's own HTTP handler, and a node that never renders never starts
Playwright or Chromium (:mod:`~project.rendering.browser`). Every render is
bounded in time (:mod:`~project.rendering.handler`), and what a seed or a payload
may ask of Chromium is checked on the frontier's wire (:mod:`~project.rendering.wire`).
"""

"""JavaScript rendering with scrapy-playwright and Debian's Chromium.

Chromium renders a request only when its ``meta["playwright"]`` is true, when
a URL rule matches it (:mod:`~project.rendering.middleware`), or when a spider
asks for a second, rendered fetch (``FALLBACK_META_KEY``). Everything else goes
through Scrapy's own HTTP handler, and a node that never renders never starts
Playwright or Chromium (:mod:`~project.rendering.browser`). Page methods travel
through the frontier as JSON, from an allow-list (:mod:`~project.rendering.wire`).
"""

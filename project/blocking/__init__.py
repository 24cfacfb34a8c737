"""Sites that fight back: block detection, and what a blocked page becomes.

A response is blocked when the site's answer is not the page (a 403, a 429 or 503 without a
usable Retry-After, a challenge page, a redirect to one, a page without its content):
:mod:`~project.blocking.policy` says so and names the signal, a class a project may subclass
(``BLOCK_POLICY``). :mod:`~project.blocking.middleware` keeps a blocked response from the
spider: it is retried through the frontier, and dead-lettered with its signal as the reason
after ``BLOCK_MAX_TRIES``.
"""

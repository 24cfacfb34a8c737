"""Which requests Chromium renders, and in which browser context."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.http.request import NO_CALLBACK
from scrapy_playwright.page import PageMethod

from project.frontier.meta import LEASE_META_KEY
from project.frontier.stopping import SentBack, send_back
from project.rendering.config import RenderingConfig, parse_render_rules
from project.rendering.evidence import callback_name, pattern_key
from project.rendering.plan import MOST_WAITS, ROLE_BROWSER, ROLE_WAIT, WAIT_SECONDS, plan_of
from project.rendering.wire import (
    ABORT_META_KEY,
    ADAPTIVE_META_KEY,
    RULE_META_KEY,
    WAIT_FOR_META_KEY,
    WAITS_META_KEY,
)

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from project.rendering.config import RenderRule
    from project.rendering.plan import RenderPlan

__all__ = ["FALLBACK_META_KEY", "RenderWait", "RenderingMiddleware"]

logger = logging.getLogger(__name__)

#: request.meta key of a spider's rendered second fetch; such a page is never rendered again.
FALLBACK_META_KEY = "render_fallback"


class RenderWait(SentBack):
    """A request of a pattern whose samples are out: back to the fleet for a moment, so it is
    fetched the way the fleet's answer says rather than rendered meanwhile."""


#: Contexts named by the middleware: ``fleet-0``, ``fleet-1``, ...
_CONTEXT_PREFIX = "fleet-"


class RenderingMiddleware:
    """Marks requests that match a render rule and spreads renders over the browser contexts.

    Rules come from the spider's ``render_urls`` attribute if it has one, else
    from PLAYWRIGHT_RENDER_URLS. ``meta["playwright"] = False`` opts a request out.
    A render goes to a context of PLAYWRIGHT_CONTEXTS if it names one, else to
    one of the fleet's: any other name would open a context that holds one of
    PLAYWRIGHT_MAX_CONTEXTS for good, and every later render would wait for it.
    With PLAYWRIGHT_ADAPTIVE, a GET request no rule and no ``meta["playwright"]`` decides
    for goes where the fleet's render plan says (project/rendering/plan.py).
    """

    def __init__(
        self,
        rules: tuple[RenderRule, ...],
        fleet_contexts: int,
        stats: StatsCollector,
        named_contexts: tuple[str, ...] = (),
        plan: RenderPlan | None = None,
    ) -> None:
        self.rules = rules
        self.plan = plan
        self.fleet_contexts = fleet_contexts
        self.named_contexts = frozenset(named_contexts)
        self.stats = stats
        self._renders = 0
        self._warned: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """Rules of the spider, else of the settings; RenderingConfigError if one is bad."""
        config = RenderingConfig.from_settings(crawler.settings)
        spider: Spider | type[Spider] = crawler.spider or crawler.spidercls
        spider_rules = getattr(spider, "render_urls", None)
        rules = config.rules
        if spider_rules is not None:
            rules = parse_render_rules(spider_rules, f"{spider.name}.render_urls")
        assert crawler.stats is not None
        return cls(
            rules, config.fleet_contexts, crawler.stats, config.named_contexts, plan_of(crawler)
        )

    def process_request(self, request: Request) -> None:
        """Set ``playwright`` (and page methods) from a rule; pick a context for a render."""
        meta = request.meta
        added: list[str] = []
        render = meta.get("playwright")
        if render is None:
            rule = self.match(request.url)
            if rule is None:
                if not self._adaptable(request):
                    return
                added.append(ADAPTIVE_META_KEY)
                if not self._adapt(request):
                    # over plain HTTP (a sample's browser twin comes after: samples.py)
                    _list_added(meta, added)
                    return
                added.append("playwright")
            else:
                meta["playwright"] = True
                added += ["playwright", *self._apply_rule(rule, meta)]
                self.stats.inc_value("playwright/rule")
        elif not render:
            return
        context = meta.get("playwright_context")
        if not (isinstance(context, str) and context in self.named_contexts):
            foreign = context is not None and not str(context).startswith(_CONTEXT_PREFIX)
            if foreign and self._first_refusal("context"):
                logger.warning(
                    "%s names browser context %r, which is not in PLAYWRIGHT_CONTEXTS:"
                    " rendered in a context of the fleet instead (further ones are"
                    " counted in playwright/refused/context)",
                    request,
                    context,
                )
            # Names from another node (a retried request) are reassigned too: its limit may differ.
            meta["playwright_context"] = f"{_CONTEXT_PREFIX}{self._renders % self.fleet_contexts}"
            added.append("playwright_context")
            self._renders += 1
        # Contexts are shared and long-lived: one request must not set a proxy,
        # headers or credentials for every later render of the node.
        kwargs = meta.pop("playwright_context_kwargs", None)
        if kwargs is not None and self._first_refusal("context_kwargs"):
            logger.warning(
                "%s sets playwright_context_kwargs, which only PLAYWRIGHT_CONTEXTS may:"
                " ignored (further ones are counted in playwright/refused/context_kwargs)",
                request,
            )
        if added:
            _list_added(meta, added)

    def _adaptable(self, request: Request) -> bool:
        """A GET a callback of the spider parses: not robots.txt, nor another download that
        goes back to a component (``NO_CALLBACK``)."""
        return (
            self.plan is not None
            and request.method == "GET"
            and request.callback is not NO_CALLBACK
            and not request.url.endswith("/robots.txt")
        )

    def _adapt(self, request: Request) -> bool:
        """Set the request's adaptive role; True when it goes to the browser. A leased
        request of a pattern whose samples are out goes back to the fleet (RenderWait)."""
        assert self.plan is not None
        key = pattern_key(request.url, callback_name(request))
        waits = request.meta.get(WAITS_META_KEY)
        waits = waits if isinstance(waits, int) and not isinstance(waits, bool) else 0
        can_wait = bool(request.meta.get(LEASE_META_KEY)) and 0 <= waits < MOST_WAITS
        role = self.plan.decide(key, can_wait)
        self.stats.inc_value(f"render/adaptive/{role}")
        if role == ROLE_WAIT:
            request.meta[WAITS_META_KEY] = waits + 1
            why = f"RenderWait: its render pattern's samples are out (wait {waits + 1})"
            send_back(request, WAIT_SECONDS, why)
            raise RenderWait(why)
        request.meta[ADAPTIVE_META_KEY] = {"k": key, "r": role}
        if role != ROLE_BROWSER:
            return False
        request.meta["playwright"] = True
        return True

    @staticmethod
    def _apply_rule(rule: RenderRule, meta: dict[str, object]) -> list[str]:
        """Put *rule*'s page methods, wait and aborts on a request; the meta keys it set."""
        added = []
        methods = [PageMethod(m.method, *m.args, **m.kwargs) for m in rule.page_methods]
        own = "playwright_page_goto_kwargs" in meta or "playwright_page_methods" in meta
        if rule.wait_for is not None and not own:
            # the page's own load event is not waited for: the rule's selector is enough
            meta["playwright_page_goto_kwargs"] = {"wait_until": "domcontentloaded"}
            methods.insert(0, PageMethod("wait_for_selector", rule.wait_for))
            meta[WAIT_FOR_META_KEY] = rule.wait_for
            added += ["playwright_page_goto_kwargs", WAIT_FOR_META_KEY]
        if methods and "playwright_page_methods" not in meta:
            # Fresh objects: the handler stores each method's result on them.
            meta["playwright_page_methods"] = methods
            added.append("playwright_page_methods")
        if rule.abort is not None:
            meta[ABORT_META_KEY] = sorted(rule.abort)
            added.append(ABORT_META_KEY)
        return added

    def match(self, url: str) -> RenderRule | None:
        """The first rule whose pattern is found in *url*."""
        for rule in self.rules:
            if rule.pattern.search(url):
                return rule
        return None

    def _first_refusal(self, what: str) -> bool:
        """Count a refused meta value; True the first time, to warn once per node."""
        self.stats.inc_value(f"playwright/refused/{what}")
        if what in self._warned:
            return False
        self._warned.add(what)
        return True


def _list_added(meta: dict[str, object], added: list[str]) -> None:
    """List in ``meta[RULE_META_KEY]`` the meta keys the middleware set (left out on the wire)."""
    previous = meta.get(RULE_META_KEY)
    if isinstance(previous, list):
        added = added + [key for key in previous if isinstance(key, str)]
    meta[RULE_META_KEY] = sorted(set(added))

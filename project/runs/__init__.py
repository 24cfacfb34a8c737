"""Crawl runs: one id for the whole fleet's crawl, and a report when it ends."""

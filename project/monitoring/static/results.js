// The items and changes pages: pages of /api/v1, drawn as tables. Every value is a
// stranger's (a scraped page): it goes in as text, never as HTML.
"use strict";
const results = (() => {
  const $ = (id) => document.getElementById(id);
  const state = { cursor: null, pages: 0, shown: 0 };

  function text(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function cell(value, className) {
    const td = document.createElement("td");
    const shown = text(value);
    td.textContent = shown.length > 300 ? shown.slice(0, 300) + "…" : shown;
    td.title = shown.slice(0, 2000);
    if (className) td.className = className;
    return td;
  }

  function flatten(doc, prefix, out) {
    for (const [key, value] of Object.entries(doc)) {
      const name = prefix + key;
      if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, name + ".", out);
      else out[name] = value;
    }
    return out;
  }

  async function getJson(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  function pager(load) {
    $("first").onclick = () => { state.cursor = null; state.pages = 0; state.shown = 0; load(); };
    $("next").onclick = () => load();
    $("query").onsubmit = (event) => { event.preventDefault(); $("first").onclick(); };
  }

  function summarise(page, what) {
    state.pages += 1;
    state.shown += page.count;
    state.cursor = page.cursor;
    $("next").disabled = !page.cursor;
    $("summary").textContent = `page ${state.pages}: ${page.count} ${what} ` +
      `(${state.shown} so far${page.cursor ? "" : ", the last page"}); token ${page.token}`;
  }

  function fail(error) {
    $("summary").textContent = "error: " + error.message;
    $("next").disabled = true;
  }

  async function itemsPage() {
    const collections = (await getJson("api/v1/collections")).collections;
    for (const c of collections) {
      const option = new Option(`${c.name} (${c.count})`, c.name);
      $("collection").add(option);
    }
    const preferred = collections.find((c) => c.name === "products");
    if (preferred) $("collection").value = "products";
    for (const run of (await getJson("api/v1/runs?limit=50")).runs) {
      $("run").add(new Option(run._id, run._id));
    }
    async function load() {
      const params = new URLSearchParams({ limit: $("limit").value });
      if ($("fields").value.trim()) params.set("fields", $("fields").value.trim());
      if ($("run").value) params.set("run", $("run").value);
      if (state.cursor) params.set("cursor", state.cursor);
      const name = encodeURIComponent($("collection").value);
      $("export-hint").textContent = `fleetcrawl export ${$("collection").value}` +
        ($("fields").value.trim() ? ` --fields ${$("fields").value.trim()}` : "") +
        ($("run").value ? ` --run ${$("run").value}` : "") + " --format csv -o items.csv";
      try {
        const page = await getJson(`api/v1/items/${name}?${params}`);
        const rows = page.items.map((doc) => flatten(doc, "", {}));
        const chosen = $("fields").value.split(",").map((f) => f.trim()).filter(Boolean);
        const columns = chosen.length ? chosen : [...new Set(rows.flatMap(Object.keys))].slice(0, 12);
        const head = $("results").tHead.rows[0];
        head.replaceChildren(...columns.map((c) => { const th = document.createElement("th"); th.textContent = c; return th; }));
        $("results").tBodies[0].replaceChildren(...rows.map((r) => {
          const tr = document.createElement("tr");
          tr.append(...columns.map((c) => cell(r[c])));
          return tr;
        }));
        summarise(page, "items");
      } catch (error) { fail(error); }
    }
    pager(load);
    await load();
  }

  async function changesPage() {
    async function load() {
      const params = new URLSearchParams({ limit: $("limit").value });
      for (const name of ["collection", "field", "item"]) {
        if ($(name).value.trim()) params.set(name, $(name).value.trim());
      }
      if (state.cursor) params.set("cursor", state.cursor);
      try {
        const page = await getJson(`api/v1/changes?${params}`);
        $("results").tBodies[0].replaceChildren(...page.changes.map((c) => {
          const tr = document.createElement("tr");
          tr.append(cell(c.written_at), cell(c.collection), cell(c.item_id), cell(c.field),
                    cell(c.old, "old"), cell(c.new, "new"), cell(c.crawl_id));
          return tr;
        }));
        summarise(page, "changes");
      } catch (error) { fail(error); }
    }
    pager(load);
    await load();
  }

  return { itemsPage, changesPage, state };
})();

// The waiting-room page's script (gateway/http/waiting_page.py inlines it; its texts are
// texts.json). It reads the sku from its path and the buyer from ?user_id=,
// then walks the API: GET /v1/skus/{sku}, POST /v1/queue/{sku}, GET
// /v1/queue/{sku}/{ticket} at the poll_after_s it is told, POST /v1/purchase,
// GET /v1/orders/{request_id}?user_id= (the lookup answers its buyer alone).
// #waiting-room's data-state (and data-position, data-order-id,
// data-starts-at) say where the buyer stands; docs/waiting-page.md.
"use strict";
(() => {
  const T = JSON.parse(document.getElementById("wr-texts").textContent);
  const $ = (id) => document.getElementById(id);
  const root = $("waiting-room");
  const [statusEl, etaEl, noteEl, bar] = [$("wr-status"), $("wr-eta"), $("wr-note"), $("wr-progress")];
  const [buyBtn, retryBtn] = [$("buy"), $("retry")];
  const path = location.pathname;
  const sku = decodeURIComponent(path.slice(path.lastIndexOf("/") + 1));
  const query = new URLSearchParams(location.search);
  const user = query.get("user_id") || "";
  const returnTo = query.get("return_to");
  const enc = encodeURIComponent;
  const key = (name) => `waiting-room:${sku}:${user}:${name}`;
  let skewMs = null; // the gateway's clock minus ours, from its first Date header
  let token = null;
  let ticker = 0;
  let buying = false;

  const say = (name, vars) =>
    (T[name] || "").replace(/\{(\w+)\}/g, (_, k) => (vars && k in vars ? String(vars[k]) : ""));
  const duration = (seconds) => {
    const s = Math.max(0, Math.ceil(seconds));
    if (s < 60) return say("seconds", { s });
    if (s < 3600) return say("minutes", { m: Math.floor(s / 60), s: s % 60 });
    return say("hours", { h: Math.floor(s / 3600), m: Math.floor((s % 3600) / 60) });
  };
  const now = () => Date.now() + (skewMs || 0);
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
  // Retry-After (without one, a doubling step), stretched by up to half again at
  // random, so buyers turned away together do not all come back together.
  const backoff = (retryAfter, attempt) =>
    1000 * Math.min(60, retryAfter ?? 2 ** Math.min(attempt, 5)) * (1 + Math.random() / 2);

  function show(state, text, attrs) {
    clearInterval(ticker);
    root.dataset.state = state;
    for (const name of ["position", "orderId", "startsAt"]) delete root.dataset[name];
    Object.assign(root.dataset, attrs || {});
    root.setAttribute("aria-busy", String(state === "joining" || state === "buying"));
    if (statusEl.textContent !== text) statusEl.textContent = text; // aria-live: said once
    etaEl.textContent = noteEl.textContent = "";
    bar.hidden = state !== "waiting";
    buyBtn.hidden = state !== "admitted" && state !== "buying";
    buyBtn.disabled = state !== "admitted";
    retryBtn.hidden = true;
  }

  async function call(method, url, body, headers) {
    let resp;
    try {
      resp = await fetch(url, {
        method,
        cache: "no-store",
        credentials: "same-origin",
        headers: body ? { "Content-Type": "application/json", ...headers } : headers,
        body: body ? JSON.stringify(body) : undefined,
      });
    } catch (e) {
      return { status: 0, body: {}, retryAfter: null };
    }
    const date = Date.parse(resp.headers.get("Date") || "");
    if (skewMs === null && !Number.isNaN(date)) skewMs = date - Date.now();
    const retryAfter = parseFloat(resp.headers.get("Retry-After") || "");
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = null;
    }
    return {
      status: resp.status,
      body: data && typeof data === "object" ? data : {},
      retryAfter: Number.isFinite(retryAfter) ? retryAfter : null,
    };
  }

  // A call that rides out 429, 503 and a lost connection, backing off each time.
  async function patient(method, url, body, headers) {
    for (let attempt = 0; ; attempt++) {
      const r = await call(method, url, body, headers);
      if (r.status !== 0 && r.status !== 429 && r.status !== 503) {
        noteEl.textContent = "";
        return r;
      }
      const ms = backoff(r.retryAfter, attempt);
      noteEl.textContent = say(r.status ? "busy" : "offline", { time: duration(ms / 1000) });
      await pause(ms);
    }
  }

  function fail(r, retry) {
    const b = r.body || {};
    show("error", b.status && T[b.status] ? say(b.status) : say("error"));
    if (b.detail) noteEl.textContent = say("detail", { detail: b.detail });
    if (retry && r.retryAfter !== null) {
      // The API says trying again is safe (409 in_progress, 429, 503): same request id.
      retryBtn.hidden = false;
      retryBtn.disabled = true;
      etaEl.textContent = say("retry_in", { time: duration(r.retryAfter) });
      setTimeout(() => (retryBtn.disabled = false), r.retryAfter * 1000);
      retryBtn.onclick = retry;
    }
  }

  const soldOut = () => show("sold_out", say("sold_out"));

  function confirmed(orderId) {
    show("confirmed", say("confirmed"), { orderId: String(orderId) });
    etaEl.textContent = say("order", { order_id: orderId });
  }

  function notStarted(starts) {
    show("not_started", say("not_started"), { startsAt: new Date(starts).toISOString() });
    const tick = () => (etaEl.textContent = say("countdown", { time: duration((starts - now()) / 1000) }));
    tick();
    ticker = setInterval(tick, 1000);
  }

  function waiting(standing, first) {
    const text = standing.position === 1 ? say("next") : say("waiting", { position: standing.position });
    show("waiting", text, { position: String(standing.position) });
    etaEl.textContent = say("eta", { time: duration(standing.eta_s) });
    bar.value = Math.round((100 * (first - standing.position)) / first);
  }

  function admitted(tok, expiresAt) {
    token = tok;
    if (returnTo) {
      const target = new URL(returnTo);
      const fragment = { sku, user_id: user };
      if (tok) Object.assign(fragment, { admission_token: tok, expires_at: expiresAt });
      target.hash = new URLSearchParams(fragment).toString();
      show("admitted", say("redirecting"));
      buyBtn.hidden = true;
      location.assign(target.href);
      return;
    }
    show("admitted", say("admitted"));
    if (expiresAt) etaEl.textContent = say("admitted_until", { time: new Date(expiresAt).toLocaleTimeString() });
  }

  // The request id: made once per page and sku, kept for reloads and double clicks;
  // 128 random bits, so nobody can guess it.
  function requestId() {
    let rid = sessionStorage.getItem(key("request_id"));
    if (!rid) {
      const bytes = crypto.getRandomValues(new Uint8Array(16));
      rid = "wr-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      sessionStorage.setItem(key("request_id"), rid);
    }
    return rid;
  }

  async function buy() {
    if (buying) return;
    buying = true;
    show("buying", say("buying"));
    const rid = requestId();
    sessionStorage.setItem(key("sent"), "1");
    const headers = token ? { "Admission-Token": token } : {};
    const r = await call("POST", "/v1/purchase", { sku, user_id: user, qty: 1, request_id: rid }, headers);
    buying = false;
    await answered(r, rid);
  }

  // GET /v1/orders/{request_id}, as its buyer.
  const order = (rid, query) => patient("GET", `/v1/orders/${enc(rid)}?user_id=${enc(user)}${query}`);

  async function answered(r, rid) {
    for (let i = 0; r.status === 202 && i < 30; i++) {
      // Queued (the queue strategy): its outcome, held by the gateway until final.
      r = await order(rid, "&wait=20");
    }
    if (r.status === 200 || r.status === 201) return confirmed(r.body.order_id);
    if (r.body.status === "sold_out") return soldOut();
    if (r.body.status === "not_started") {
      notStarted(Date.parse(r.body.starts_at));
      await pause(backoff(r.retryAfter, 0));
      return admitted(token, null);
    }
    return fail(r, buy);
  }

  // After a reload: a purchase already sent is looked up, never sent again.
  async function resumed() {
    if (!sessionStorage.getItem(key("sent"))) return false;
    const rid = requestId();
    const r = await order(rid, "");
    if (r.status === 404) return false; // nothing was ordered under it: go on
    await answered(r, rid);
    return true;
  }

  async function opening(startsAt) {
    const starts = startsAt ? Date.parse(startsAt) : 0;
    if (starts <= now()) return;
    notStarted(starts);
    // Every countdown ends at once: spread the first purchases over a second.
    await pause(starts - now() + Math.random() * 1000);
  }

  async function line(starts) {
    for (let joins = 0; joins < 3; joins++) {
      const r = await patient("POST", `/v1/queue/${enc(sku)}`, { user_id: user });
      if (r.body.status === "sold_out") return soldOut();
      if (r.status !== 200) return fail(r);
      // The place first seen on this ticket, kept across reloads: the bar's 0 %.
      const seen = JSON.parse(sessionStorage.getItem(key("line")) || "{}");
      const first = seen.ticket === r.body.ticket ? seen.first : Math.max(1, r.body.position);
      sessionStorage.setItem(key("line"), JSON.stringify({ ticket: r.body.ticket, first }));
      if ((await poll(r.body.ticket, r.body, starts, first)) !== "unknown") return;
    }
    return show("error", say("error"));
  }

  async function poll(ticket, standing, starts, first) {
    for (;;) {
      if (standing.status === "admitted") return admitted(standing.admission_token, standing.expires_at);
      if (standing.status === "sold_out") return soldOut();
      if (standing.position > 0 && starts > now()) notStarted(starts);
      else if (standing.position > 0) waiting(standing, first);
      // Never sooner than the API asks (a ticket already let in: at once).
      if (standing.position !== 0) await pause(1000 * standing.poll_after_s * (1 + Math.random() / 10));
      const r = await patient("GET", `/v1/queue/${enc(sku)}/${enc(ticket)}`);
      if (r.status === 404 && r.body.error === "unknown_ticket") return "unknown"; // expired: join again
      if (r.status !== 200) return fail(r);
      standing = r.body;
    }
  }

  async function start() {
    document.documentElement.lang = T.lang || "en";
    document.title = $("wr-title").textContent = say("title", { sku });
    buyBtn.textContent = say("buy");
    retryBtn.textContent = say("retry");
    show("joining", say("joining"));
    if (await resumed()) return;
    const r = await patient("GET", `/v1/skus/${enc(sku)}`);
    if (r.status !== 200) return fail(r);
    const info = r.body;
    if (info.ends_at && Date.parse(info.ends_at) <= now()) return show("error", say("ended"));
    if (info.waiting_room) return line(info.starts_at ? Date.parse(info.starts_at) : 0);
    if (info.available <= 0) return soldOut();
    await opening(info.starts_at);
    return admitted(null, null);
  }

  buyBtn.addEventListener("click", buy);
  start().catch((e) => {
    show("error", say("error"));
    noteEl.textContent = String(e);
  });
})();

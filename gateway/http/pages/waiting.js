// The waiting-room page's script (gateway/http/waiting_page.py inlines it, with
// the texts of <html lang>'s language, texts/<lang>.json). It reads the sku from
// its path and the buyer from ?user_id=, then walks the API: GET /v1/skus/{sku},
// POST /v1/queue/{sku}, GET /v1/queue/{sku}/{ticket} at the poll_after_s it is
// told, POST /v1/purchase, GET /v1/orders/{request_id}?user_id= (the lookup
// answers its buyer alone): an order with a payment window is watched until it
// is paid, cancelled or expired. #waiting-room's data-state (and data-position,
// data-order-id, data-order-status, data-pay-by, data-starts-at) say where the
// buyer stands; docs/waiting-rooms.md.
"use strict";
(() => {
  const T = JSON.parse(document.getElementById("wr-texts").textContent);
  const lang = document.documentElement.lang;
  const number = new Intl.NumberFormat(lang);
  const $ = (id) => document.getElementById(id);
  const root = $("waiting-room");
  const [statusEl, etaEl, noteEl, bar] = [$("wr-status"), $("wr-eta"), $("wr-note"), $("wr-progress")];
  const [buyBtn, retryBtn, payLink, deadlineEl] = [$("buy"), $("retry"), $("pay"), $("wr-deadline")];
  const path = location.pathname;
  const sku = decodeURIComponent(path.slice(path.lastIndexOf("/") + 1));
  const query = new URLSearchParams(location.search);
  const user = query.get("user_id") || "";
  const returnTo = query.get("return_to");
  const payTo = query.get("pay_to");
  // A room that checks for bots: the token of the shop's widget, from the URL or
  // posted by a window of the shop's own origin (return_to's or pay_to's).
  let botToken = query.get("bot_token");
  let botTokenGiven = null;
  const shopOrigins = [returnTo, payTo].filter(Boolean).map((u) => new URL(u, location.href).origin);
  addEventListener("message", (e) => {
    const given = e.data && e.data.bot_token;
    if (!shopOrigins.includes(e.origin) || typeof given !== "string") return;
    botToken = given;
    if (botTokenGiven) botTokenGiven();
  });
  const enc = encodeURIComponent;
  const key = (name) => `waiting-room:${sku}:${user}:${name}`;
  // The gateway's clock minus ours lies in [lo, hi]: each Date header (whole
  // seconds, rounded down) was stamped between its request's sending and its
  // answer. Each answer narrows it: a countdown keeps to the gateway's clock
  // (within half the interval) however far off this device's clock is.
  let skew = { lo: -Infinity, hi: Infinity };
  let token = null;
  let admittedUntil = 0; // when this admission's token expires (ms, the gateway's clock)
  let ticker = 0;
  let buying = false;
  let views = 0; // counts show(): a loop started for an older view stops
  // How often an order waiting for its payment is looked up (a tenth more at
  // random), besides whenever the tab is shown again.
  const WATCH_MS = 30000;

  // A text by name, its {placeholders} filled in (numbers as the language writes
  // them). One missing from this language's file is logged: the tests fail on it.
  const say = (name, vars) => {
    if (!(name in T)) console.error(`waiting page: no ${lang} text "${name}"`);
    const put = (v) => (typeof v === "number" ? number.format(v) : String(v));
    return (T[name] || "").replace(/\{(\w+)\}/g, (_, k) => (vars && k in vars ? put(vars[k]) : ""));
  };
  // A countdown (``exact``) keeps its seconds past an hour; an estimate does not.
  // Past 48 hours, in days.
  const duration = (seconds, exact) => {
    const s = Math.max(0, Math.ceil(seconds));
    if (s < 60) return say("seconds", { s });
    if (s < 3600) return say("minutes", { m: Math.floor(s / 60), s: s % 60 });
    const d = s < 2 * 86400 ? 0 : Math.floor(s / 86400);
    const [h, m] = [Math.floor((s - d * 86400) / 3600), Math.floor((s % 3600) / 60)];
    const unit = s < 2 * 86400 ? "hours" : "days";
    return say(exact ? `${unit}_exact` : unit, { d, h, m, s: s % 60 });
  };
  const now = () => Date.now() + (Number.isFinite(skew.lo + skew.hi) ? (skew.lo + skew.hi) / 2 : 0);
  function clocked(date, sent, got) {
    const [lo, hi] = [date - got, date + 1000 - sent];
    // Outside what is known: our clock was set meanwhile; start again from this answer.
    skew = lo > skew.hi || hi < skew.lo ? { lo, hi } : { lo: Math.max(lo, skew.lo), hi: Math.min(hi, skew.hi) };
  }
  // setTimeout fires at once past 2^31 ms (about 24 days): a longer pause waits in steps.
  const pause = (ms) =>
    new Promise((resolve) => {
      const end = Date.now() + ms;
      const step = () => (Date.now() >= end ? resolve() : setTimeout(step, Math.min(end - Date.now(), 2 ** 30)));
      step();
    });
  // Retry-After (without one, a doubling step), stretched by up to half again at
  // random, so buyers turned away together do not all come back together.
  const backoff = (retryAfter, attempt) =>
    1000 * Math.min(60, retryAfter ?? 2 ** Math.min(attempt, 5)) * (1 + Math.random() / 2);

  function show(state, text, attrs) {
    clearInterval(ticker);
    views++;
    root.dataset.state = state;
    for (const name of ["position", "orderId", "orderStatus", "payBy", "held", "startsAt"]) delete root.dataset[name];
    Object.assign(root.dataset, attrs || {});
    root.setAttribute("aria-busy", String(state === "joining" || state === "buying"));
    if (statusEl.textContent !== text) statusEl.textContent = text; // aria-live: said once
    etaEl.textContent = noteEl.textContent = deadlineEl.textContent = "";
    payLink.hidden = true;
    bar.hidden = state !== "waiting";
    buyBtn.hidden = state !== "admitted" && state !== "buying";
    buyBtn.disabled = state !== "admitted";
    retryBtn.hidden = true;
    retryBtn.textContent = say("retry");
  }

  async function call(method, url, body, headers) {
    let resp;
    const sent = Date.now();
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
    if (!Number.isNaN(date)) clocked(date, sent, Date.now());
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
      pause(r.retryAfter * 1000).then(() => (retryBtn.disabled = false));
      retryBtn.onclick = retry;
    }
  }

  const soldOut = () => show("sold_out", say("sold_out"));

  // An order as the API answers it (201 or GET /v1/orders): its status decides the view.
  function ordered(order) {
    const status = order.status || "confirmed";
    if (status === "pending_payment") return pending(order);
    if (status === "expired" || status === "cancelled") return closed(order, true);
    show("confirmed", say(status === "paid" ? "paid" : "confirmed"), {
      orderId: String(order.order_id),
      orderStatus: status,
    });
    etaEl.textContent = say("order", { order_id: order.order_id });
  }

  // Held until pay_by: the deadline, a countdown, the shop's pay link, and a
  // lookup now and then (and whenever the tab is shown again) for a payment or a
  // cancel; at the deadline it is expired, which the lookup then confirms.
  function pending(order) {
    const due = Date.parse(order.pay_by);
    show("confirmed", say("pending"), {
      orderId: String(order.order_id),
      orderStatus: "pending_payment",
      payBy: new Date(due).toISOString(),
    });
    etaEl.textContent = say("order", { order_id: order.order_id });
    if (payTo) {
      const target = new URL(payTo);
      target.searchParams.set("request_id", order.request_id);
      payLink.href = target.href;
      payLink.hidden = false;
    }
    const view = views;
    const day = new Date(due);
    const today = day.toDateString() === new Date(now()).toDateString();
    const at = today ? day.toLocaleTimeString(lang) : day.toLocaleString(lang);
    const tick = () => {
      const left = (due - now()) / 1000;
      if (left > 0) return (deadlineEl.textContent = say("pay_by", { at, time: duration(left, true) }));
      closed({ ...order, status: "expired" }, false);
      untilClosed(order, views);
    };
    tick();
    ticker = setInterval(tick, 1000);
    watch(order, view);
  }

  async function watch(order, view) {
    let shown = () => {};
    const onShow = () => document.visibilityState === "visible" && shown();
    document.addEventListener("visibilitychange", onShow);
    try {
      while (views === view) {
        await Promise.race([pause(WATCH_MS * (1 + Math.random() / 10)), new Promise((r) => (shown = r))]);
        if (views !== view) return;
        const r = await lookUp(order.request_id, "");
        if (views === view && r.status === 200 && r.body.status !== "pending_payment") return ordered(r.body);
      }
    } finally {
      document.removeEventListener("visibilitychange", onShow);
    }
  }

  // Past pay_by by this page's clock: asks until the gateway's sweep agrees
  // (or a payment just before the deadline won), a second apart.
  async function untilClosed(order, view) {
    for (let i = 0; i < 30 && views === view; i++) {
      const r = await lookUp(order.request_id, "");
      if (views !== view) return;
      if (r.status === 200 && r.body.status !== "pending_payment") {
        return r.body.status === "expired" ? offerAgain(view) : ordered(r.body);
      }
      await pause(1000);
    }
  }

  // Expired or cancelled: said so and, once the gateway agrees (``known``),
  // another try offered while the sale has units on sale (or a room, whose
  // line waits for held units to come back).
  function closed(order, known) {
    show("expired", say(order.status), { orderId: String(order.order_id), orderStatus: order.status });
    if (known) offerAgain(views);
  }

  async function offerAgain(view) {
    const r = await patient("GET", `/v1/skus/${enc(sku)}`);
    if (views !== view || r.status !== 200) return;
    const info = r.body;
    const ended = info.ends_at && Date.parse(info.ends_at) <= now();
    if (ended || (info.available <= 0 && !info.waiting_room)) return (etaEl.textContent = say("none_left"));
    etaEl.textContent = say("again");
    retryBtn.hidden = retryBtn.disabled = false;
    retryBtn.onclick = again;
  }

  // Sold out while units are held for buyers who have not paid: one may come
  // back at the earliest deadline (Retry-After), and the buyer may try then.
  function heldOut(r) {
    show("sold_out", say("sold_out_held", { held: r.body.held }), { held: String(r.body.held) });
    const wait = (r.retryAfter ?? 1) + 1; // back on sale within a second of the deadline
    etaEl.textContent = say("held_again", { time: duration(wait) });
    retryBtn.hidden = false;
    retryBtn.disabled = true;
    retryBtn.onclick = again;
    pause(wait * 1000).then(() => (retryBtn.disabled = false));
  }

  // Another purchase, under a new request id (the one before keeps its answer),
  // from the top: the sku's stock, its room.
  function again() {
    for (const name of ["request_id", "sent", "line"]) sessionStorage.removeItem(key(name));
    token = null;
    return start().catch(broken);
  }

  // A turn in line buys once: the order that expired or was cancelled spent
  // it. Its close ends the turn, so a join gives a new ticket at once; when
  // that could not be done (Redis failing then), the buyer joins again, at
  // the back, once that turn's token has expired (by Redis's clock: a second
  // or two's margin).
  async function rejoin() {
    show("joining", say("rejoin"));
    const tick = () => (etaEl.textContent = say("rejoin_in", { time: duration((admittedUntil - now()) / 1000, true) }));
    tick();
    ticker = setInterval(tick, 1000);
    const view = views;
    await pause(admittedUntil - now() + 2000);
    if (views === view) return again();
  }

  function notStarted(starts) {
    show("not_started", say("not_started"), { startsAt: new Date(starts).toISOString() });
    const tick = () => (etaEl.textContent = say("countdown", { time: duration((starts - now()) / 1000, true) }));
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
    if (expiresAt) admittedUntil = Date.parse(expiresAt);
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
    if (!tok) return show("admitted", say("admitted"));
    // Buy is offered only while the token buys: at its expiry the turn is over.
    if (admittedUntil <= now()) return turnEnded();
    show("admitted", say("admitted"));
    etaEl.textContent = say("admitted_until", { time: new Date(admittedUntil).toLocaleTimeString(lang) });
    const view = views;
    pause(admittedUntil - now()).then(() => views === view && turnEnded());
  }

  // The token expired unspent: said so, and a button joins the line again, at
  // the back, once Redis has dropped the turn too (two seconds' margin).
  function turnEnded() {
    show("turn_ended", say("turn_ended"));
    etaEl.textContent = say("turn_again");
    token = null;
    retryBtn.textContent = say("join_again");
    retryBtn.hidden = false;
    retryBtn.disabled = true;
    retryBtn.onclick = again;
    const view = views;
    pause(admittedUntil - now() + 2000).then(() => views === view && (retryBtn.disabled = false));
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
  const lookUp = (rid, query) => patient("GET", `/v1/orders/${enc(rid)}?user_id=${enc(user)}${query}`);

  // The request id of this buyer's order, whichever of this browser's tabs
  // bought it: localStorage is shared by the origin's tabs and stays on this
  // device; the lookup answers the buyer alone. Shown when it stands (an
  // expired, cancelled or refunded order may be bought again), unless the view moved on.
  async function boughtElsewhere(rid) {
    const other = localStorage.getItem(key("bought"));
    if (!other || other === rid) return false;
    const view = views;
    const r = await lookUp(other, "");
    if (views !== view || r.status !== 200 || ["expired", "cancelled", "refunded"].includes(r.body.status)) return false;
    sessionStorage.setItem(key("request_id"), other);
    sessionStorage.setItem(key("sent"), "1");
    ordered(r.body);
    return true;
  }

  async function answered(r, rid) {
    for (let i = 0; r.status === 202 && i < 30; i++) {
      // Queued (the queue strategy): its outcome, held by the gateway until final.
      r = await lookUp(rid, "&wait=20");
    }
    if (r.status === 200 || r.status === 201) {
      localStorage.setItem(key("bought"), rid);
      return ordered(r.body);
    }
    // Whatever the API said to this tab's token (used, duplicate ...), an order
    // bought from another tab is the answer.
    if (await boughtElsewhere(rid)) return;
    if (r.body.status === "sold_out") return r.body.held ? heldOut(r) : soldOut();
    if (r.status === 403 && token) return admittedUntil > now() ? rejoin() : turnEnded();
    if (r.body.status === "not_started") {
      // Counted down to the start the API gave, however far off (a second at
      // least, should this device's clock run ahead).
      const starts = Date.parse(r.body.starts_at);
      notStarted(starts);
      await pause(Math.max(1000, starts - now() + Math.random() * 1000));
      return admitted(token, null);
    }
    return fail(r, buy);
  }

  // After a reload: a purchase already sent is looked up, never sent again.
  async function resumed() {
    if (!sessionStorage.getItem(key("sent"))) return false;
    const rid = requestId();
    const r = await lookUp(rid, "");
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
      const body = botToken ? { user_id: user, bot_token: botToken } : { user_id: user };
      const r = await patient("POST", `/v1/queue/${enc(sku)}`, body);
      if (r.body.status === "sold_out") return soldOut();
      if (r.status === 403 && r.body.error === "bot_check_failed") {
        // Missing, refused or spent: the shop's page gives another, then we join.
        botToken = null;
        show("bot_check", say("bot_check"));
        await new Promise((resolve) => (botTokenGiven = resolve));
        botTokenGiven = null;
        joins--;
        continue;
      }
      if (r.status !== 200) return fail(r);
      spentBotToken();
      // The place first seen on this ticket, kept across reloads: the bar's 0 %.
      const seen = JSON.parse(sessionStorage.getItem(key("line")) || "{}");
      const first = seen.ticket === r.body.ticket ? seen.first : Math.max(1, r.body.position);
      sessionStorage.setItem(key("line"), JSON.stringify({ ticket: r.body.ticket, first }));
      if ((await poll(r.body.ticket, r.body, starts, first)) !== "unknown") return;
    }
    return show("error", say("error"));
  }

  // A token makes one ticket, which is joined again without one: off the URL,
  // so a reload does not send it spent.
  function spentBotToken() {
    botToken = null;
    if (!query.has("bot_token")) return;
    query.delete("bot_token");
    history.replaceState(history.state, "", `${path}?${query}${location.hash}`);
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
    document.title = $("wr-title").textContent = say("title", { sku });
    buyBtn.textContent = say("buy");
    payLink.textContent = say("pay");
    show("joining", say("joining"));
    if ((await resumed()) || (await boughtElsewhere(null))) {
      const r = await call("GET", `/v1/skus/${enc(sku)}`);
      return r.status === 200 && describe(r.body);
    }
    const r = await patient("GET", `/v1/skus/${enc(sku)}`);
    if (r.status !== 200) return fail(r);
    const info = r.body;
    describe(info);
    if (info.ends_at && Date.parse(info.ends_at) <= now()) return show("error", say("ended"));
    if (info.waiting_room) return line(info.starts_at ? Date.parse(info.starts_at) : 0);
    if (info.available <= 0) return soldOut();
    await opening(info.starts_at);
    return admitted(null, null);
  }

  // What is sold, in the operator's words: set as text, never as markup.
  function describe(info) {
    const img = $("wr-image");
    if (info.title) document.title = $("wr-title").textContent = info.title;
    if (info.image_url) {
      img.setAttribute("alt", info.title || sku);
      img.onerror = () => (img.hidden = true); // blocked or gone: no broken icon
      img.setAttribute("src", info.image_url);
      img.hidden = false;
    }
    $("wr-price").textContent = info.price_text || "";
    $("wr-product").hidden = !(info.image_url || info.price_text);
  }

  function broken(e) {
    show("error", say("error"));
    noteEl.textContent = String(e);
  }

  buyBtn.addEventListener("click", buy);
  // Another tab bought: a tab not buying shows that order at once (one
  // refused for a token that tab spent is rejoining: it stops).
  addEventListener("storage", (e) => {
    const idle = ["admitted", "turn_ended", "joining", "error"].includes(root.dataset.state);
    if (e.key === key("bought") && e.newValue && idle) boughtElsewhere(null).catch(broken);
  });
  start().catch(broken);
})();

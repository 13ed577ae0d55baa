// The status page's one script: every few seconds, fetch the page's content from the daemon
// that served the page and swap it in, so the page stays current without a reload.
// Same origin only: the browser sends the credentials it already has (HTTP Basic or none);
// no token is ever put in a URL. While the tab is hidden, nothing is fetched.
(function () {
  "use strict";
  var content = document.getElementById("content");
  var note = document.getElementById("refresh-note");
  if (!content || !window.fetch || !window.URL) {
    return;
  }
  // Resolved against the page without the user name and password a URL may carry: a fetch
  // from such a URL is refused, and the browser sends the credentials it has anyway.
  var source = new URL(content.getAttribute("data-src"), document.baseURI);
  source.username = "";
  source.password = "";
  var every = Number(content.getAttribute("data-every-ms")) || 2000;
  var initial = note ? note.textContent : "";

  function say(text, bad) {
    if (note) {
      note.textContent = text;
      note.className = bad ? "bad" : "";
    }
  }

  function later() {
    window.setTimeout(refresh, every);
  }

  function refresh() {
    if (document.hidden) {
      later();
      return;
    }
    window.fetch(source.href, { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        content.innerHTML = html; // rendered and escaped by the daemon
        say(initial, false);
      })
      .catch(function (error) {
        say("refresh failed (" + error.message + "); retrying", true);
      })
      .then(later);
  }

  later();
})();

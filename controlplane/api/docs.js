// /docs: start Swagger UI on the daemon's OpenAPI document.
// The document's address is resolved against the page without the user name and password the
// page's own address may carry (http://ops:TOKEN@cp:8080/docs): a browser refuses a fetch from
// such a URL, and it sends the credentials it already holds for this origin anyway.
(function () {
  "use strict";
  var self = document.getElementById("docs-start");
  var spec = new URL(self.getAttribute("data-spec"), document.baseURI);
  spec.username = "";
  spec.password = "";
  var options = JSON.parse(self.getAttribute("data-options") || "{}");
  options.url = spec.href;
  options.dom_id = "#swagger-ui";
  options.presets = [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset];
  window.ui = SwaggerUIBundle(options);
})();

// Starts the playground's Go client. Everything interactive is Go; this
// file only loads it, and says so on the page if that fails.
(function () {
	const banner = document.getElementById("banner");
	const go = new Go();
	WebAssembly.instantiateStreaming(fetch(document.body.dataset.wasm), go.importObject)
		.then((result) => go.run(result.instance))
		.catch((err) => {
			banner.textContent = "The client did not start: " + err;
			banner.className = "banner down";
		});
})();

package docs

import (
	"regexp"
	"strings"
	"testing"
)

// Every link of every served page that names a place (#id) leads to an
// id there: on the page itself, on another served page, or on /source.
func TestPages_EveryLinkToAPlaceFindsIt(t *testing.T) {
	pages, _, err := Pages()
	if err != nil {
		t.Fatal(err)
	}
	ids := regexp.MustCompile(`\bid="([^"]+)"`)
	links := regexp.MustCompile(`\bhref="(/docs/[^"#]*|/source)?#([^"]+)"`)
	places := map[string]map[string]bool{"/source": {}}
	for _, m := range ids.FindAllSubmatch(SourcePage, -1) {
		places["/source"][string(m[1])] = true
	}
	for _, p := range pages {
		places[p.Name] = map[string]bool{}
		for _, m := range ids.FindAllSubmatch(p.HTML, -1) {
			places[p.Name][string(m[1])] = true
		}
	}
	checked := 0
	for _, p := range pages {
		for _, m := range links.FindAllSubmatch(p.HTML, -1) {
			target := string(m[1])
			if target == "" {
				target = "/docs/" + p.Name
			}
			page := strings.TrimPrefix(target, "/docs/")
			checked++
			if !places[page][string(m[2])] {
				t.Errorf("/docs/%s links to %s#%s, which has no such id",
					p.Name, target, m[2])
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d links: the search is broken", checked)
	}
	t.Logf("%d links to a place, each found", checked)
}

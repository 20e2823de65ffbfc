package serve

import (
	"net/http"
	"slices"
	"strings"
)

// cors lets the browser pages of Config.CORSOrigin call the API: their
// requests get Access-Control-Allow-Origin, and their preflights (an
// OPTIONS with Access-Control-Request-Method) are answered here, before
// the API key is asked for (a browser sends none with a preflight). A
// page of another origin gets no such header, so its browser refuses it
// the answer, as the default (no -cors-origin) does for every page. A
// preflight from an allowed origin may send the headers it asks for.
func (s *Server) cors(next http.Handler) http.Handler {
	var origins []string
	for _, o := range strings.Split(s.cfg.CORSOrigin, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	if len(origins) == 0 {
		return next
	}
	any := slices.Contains(origins, "*")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := origin != "" && (any || slices.Contains(origins, origin))
		if allowed {
			w.Header().Add("Vary", "Origin")
			w.Header().Set("Access-Control-Allow-Origin", origin)
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			if allowed {
				w.Header().Add("Vary", "Access-Control-Request-Headers")
				w.Header().Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				w.Header().Set("Access-Control-Allow-Headers", allowHeaders(r.Header.Get("Access-Control-Request-Headers")))
				w.Header().Set("Access-Control-Max-Age", "600")
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if allowed {
			w.Header().Set("Access-Control-Expose-Headers", "Retry-After")
		}
		next.ServeHTTP(w, r)
	})
}

// allowHeaders is a preflight's Access-Control-Allow-Headers: the
// headers the page asked to send (the openai package sends its own
// x-stainless-* ones, and newer versions more), as long as each is a
// header name, besides Authorization and Content-Type. An allowed origin
// is trusted with the API; which headers it sends changes nothing.
func allowHeaders(requested string) string {
	names := []string{"Authorization", "Content-Type"}
	for _, h := range strings.Split(requested, ",") {
		h = strings.TrimSpace(h)
		if h == "" || len(h) > 64 || strings.IndexFunc(h, func(c rune) bool { return !isTokenChar(c) }) >= 0 {
			continue
		}
		if !slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, h) }) && len(names) < 64 {
			names = append(names, h)
		}
	}
	return strings.Join(names, ", ")
}

// isTokenChar reports whether c may be in a header name (RFC 9110's
// tchar).
func isTokenChar(c rune) bool {
	return c < 127 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c))
}

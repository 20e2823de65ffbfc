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
// the answer, as the default (no -cors-origin) does for every page.
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
				w.Header().Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
				w.Header().Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
				w.Header().Set("Access-Control-Max-Age", "600")
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

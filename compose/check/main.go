// Validates compose files with compose-go, the loader `docker compose config` uses, for a
// machine without the compose plugin: `cd compose/check && go run . ../docker-compose.yml`
// prints the normalized project (the demo profile included) or the first error, exit 1.
// It also checks what the loader does not: every bind-mounted file or directory (the
// Prometheus config, the Grafana provisioning and dashboards) exists, since Docker would
// otherwise create an empty directory in its place and the service would start without it.
// What the files say (scrape targets, datasource, dashboard metric names) is checked by
// tests/test_compose.py.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	opts, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithDotEnv, cli.WithProfiles([]string{"demo"}))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid:", err)
		os.Exit(1)
	}
	for _, service := range project.Services {
		for _, volume := range service.Volumes {
			if volume.Type != "bind" {
				continue
			}
			if _, err := os.Stat(volume.Source); err != nil {
				fmt.Fprintf(os.Stderr, "invalid: service %s mounts %s, which is missing: %v\n", service.Name, volume.Source, err)
				os.Exit(1)
			}
		}
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(string(out))
}

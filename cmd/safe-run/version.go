package main

import (
	"context"
	"fmt"
	"time"
)

// version is set at build time by the Makefile (-X main.version=...).
var version = "dev"

func cmdVersion(args []string) int {
	fmt.Println("safe-run", version)
	var host hostFlags
	path, source := host.runscPath()
	if path == "" {
		fmt.Println("runsc    not found")
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := runscVersion(ctx, path)
	if err != nil {
		v = err.Error()
	}
	fmt.Printf("runsc    %s (%s, %s)\n", v, path, source)
	return 0
}

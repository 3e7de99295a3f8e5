//go:build !race

package service

const raceOn = false

#!/bin/bash
exec bash ./twohost.sh client

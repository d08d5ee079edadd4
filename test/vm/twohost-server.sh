#!/bin/bash
exec bash ./twohost.sh server
